"""Gmail: OAuth token handling (``auth``), the API client (``client``), the reply
builder (``reply``) and ``draftgate doctor`` checks (``doctor``). The source and the
senders live in ``bot/sources/gmail.py`` and ``bot/senders/gmail.py``."""
