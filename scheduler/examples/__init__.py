"""Example handlers and an alert receiver, used by ``app.example.toml`` (see ``jobs``)."""
