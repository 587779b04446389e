"""The command line: the parser and `run` (main), and one module per command group."""
