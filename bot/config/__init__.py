"""What a YAML key means: loading the files, the checker, and the typed options."""
