"""Test doubles of llama-server for specproxy's tests and benchmarks, shipped as aiohttp ships
aiohttp.test_utils: stubs that run no model, never used to serve."""
