"""``draftgate doctor`` for Telegram: the token is set and the bot answers getMe."""

from __future__ import annotations

from telegram.error import InvalidToken, TelegramError

from ...config.load import Settings, env_secret
from ...errors import ConfigError


async def doctor(settings: Settings) -> list[tuple[str, bool, str]]:
    """For ``draftgate doctor``: the token is set and the bot answers getMe."""
    if settings.telegram is None:
        return []
    from telegram import Bot

    cfg = settings.telegram
    try:
        token = env_secret(cfg.token_env, "telegram.token_env")
    except ConfigError as exc:
        return [("telegram", False, str(exc))]
    bot = Bot(token, base_url=cfg.base_url, base_file_url=cfg.base_file_url)
    try:
        await bot.initialize()
        me = bot.bot
    except InvalidToken:  # its message quotes the token: never shown
        return [("telegram", False, f"Telegram rejected the token in ${cfg.token_env}; check "
                                    f"it with @BotFather")]
    except TelegramError as exc:
        return [("telegram", False, f"getMe failed: {exc} (check telegram.base_url and the "
                                    f"network)")]
    finally:
        await bot.shutdown()
    return [("telegram", True, f"@{me.username}, operators {len(cfg.operators)}")]
