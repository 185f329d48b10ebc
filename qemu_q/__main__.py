"""`python -m qemu_q`: the qemu-q command line (without arguments, its help)."""

import sys

from .cli import main

sys.exit(main())
