import sys

from onnxhal.cli import main

sys.exit(main())
