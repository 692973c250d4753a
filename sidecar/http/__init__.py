"""The sidecar's HTTP surface (aiohttp): request codecs and the one error mapping."""
