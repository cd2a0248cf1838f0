"""``WS /v1/realtime``: OpenAI's Realtime API over one pipeline session per connection (docs/serving.md)."""
