import signal
import sys

from ckptfs.cli.parser import main

signal.signal(signal.SIGPIPE, signal.SIG_DFL)
sys.exit(main())
