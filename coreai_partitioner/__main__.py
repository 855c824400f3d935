from coreai_partitioner.console import quiet_dependencies

quiet_dependencies()  # a command line's own run: before the dependencies are imported, as they log then

from coreai_partitioner.cli.main import main  # noqa: E402

raise SystemExit(main())
