"""The Telegram approval channel: the channel, taps on cards, commands, the transport."""
