"""initshift: a mutating admission webhook that makes init-container build pods work under a service mesh."""

__version__ = "0.1.0"
