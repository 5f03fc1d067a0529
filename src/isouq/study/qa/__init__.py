"""isouq subpackage."""
