from kvsim.cli import main

raise SystemExit(main())
