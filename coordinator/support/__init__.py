"""Small utilities shared by the agent and the simulator: atomic file writes, a rate limiter, HTTP dates."""

__all__: list[str] = []
