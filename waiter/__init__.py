"""The waiter: the standard-library entrypoint that orders steps inside a pod."""
