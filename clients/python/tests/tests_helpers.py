from lockdproc import free_port


def dead_url() -> str:
    """A 127.0.0.1 URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"
