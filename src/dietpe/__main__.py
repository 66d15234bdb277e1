"""`python -m dietpe`: the `dietpe` command, for environments where the console script is not on PATH."""

import sys

from dietpe.cli import main

sys.exit(main())
