"""Mail as bytes: MIME parsing and quoting, and building a threaded reply."""
