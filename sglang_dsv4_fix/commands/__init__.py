"""One module per subcommand; each exposes ``add_parser(sub)`` and ``run(args) -> int``."""
