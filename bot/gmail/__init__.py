"""Gmail: OAuth token handling (``auth``), the API client (``client``, with its batch
reads in ``batch`` and the send-once ``transport``) and ``draftgate doctor`` checks
(``doctor``); what a failure means in ``errors``, the shared API service in
``resource``. The source and the senders live in ``bot/sources/gmail.py`` and
``bot/senders/gmail.py``; the reply itself is built by ``bot/mail/reply.py``."""
