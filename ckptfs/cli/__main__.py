import signal
import sys

from .parser import main

signal.signal(signal.SIGPIPE, signal.SIG_DFL)
sys.exit(main())
