"""The browser demo page (``index.html`` and its scripts), served by the gateway as package data."""
