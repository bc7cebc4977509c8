"""Certificate generation, caBundle injection and rotation for the webhook."""
