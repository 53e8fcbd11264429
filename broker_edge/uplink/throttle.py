"""The uplink's bandwidth limit: a token bucket, sans-IO (the caller hands in the time and sleeps)."""

from __future__ import annotations

__all__ = ["Throttle"]


class Throttle:
    """At most ``rate`` bytes per second on average, with bursts up to one second's worth; ``rate`` None =
    no limit."""

    def __init__(self, rate: int | None, now: float) -> None:
        self.rate = rate
        self._tokens = float(rate or 0)
        self._at = now

    def delay(self, size: int, now: float) -> float:
        """Take ``size`` bytes now; returns the seconds to wait before sending them (0: at once). A message
        larger than the burst goes out once the bucket has paid for it, never refused."""
        rate = self.rate
        if rate is None:
            return 0.0
        self._tokens = min(float(rate), self._tokens + (now - self._at) * rate)
        self._at = now
        self._tokens -= size
        return 0.0 if self._tokens >= 0 else -self._tokens / rate
