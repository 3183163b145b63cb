import sys

from exactcheck.cli import main

sys.exit(main())
