"""`python -m proxy` runs the `specproxy` command."""

import sys

from proxy.cli import main

sys.exit(main())
