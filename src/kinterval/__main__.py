import sys

from kinterval.cli import main

sys.exit(main())
