"""``python -m triton_nb.cli``: the ``triton-nb`` command."""

import sys

from triton_nb.cli import main

sys.exit(main())
