import sys

from cera.cli import main

sys.exit(main())
