"""Doctor checks. ``base`` holds the types and the runner; each other module
holds the checks of one concern and registers them with ``@check``."""
