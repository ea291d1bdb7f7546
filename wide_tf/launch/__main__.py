"""`python -m wide_tf.launch`: the launcher's command line (wide_tf/launch/command.py)."""

import sys

from wide_tf.launch.command import main

if __name__ == "__main__":
    sys.exit(main())
