from predictor.cli.main import main

raise SystemExit(main())
