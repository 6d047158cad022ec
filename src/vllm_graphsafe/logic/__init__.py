"""Pure logic shared by every adapter; imports numpy at most, never vLLM."""
