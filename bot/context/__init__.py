"""What a draft is based on besides the email: the thread, team memory, knowledge."""
