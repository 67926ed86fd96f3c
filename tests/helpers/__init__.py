"""Code the tests share, imported one way: ``from tests.helpers.<module> import ...``.

A test module or a conftest file imports no other test module; what two of them need lives here, and a conftest file
holds fixtures only (``tests/test_imports.py`` checks both).
"""
