"""Serving and measurement: launch a server (real SGLang on a GPU host, or the CPU reference
backend), send prompts, and read acceptance from responses, endpoints and logs."""
