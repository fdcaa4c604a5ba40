"""Models behind an OpenAI-compatible server (vLLM, SGLang, llama.cpp, transformers serve, hosted APIs): the spec
(`spec`), HTTP with retries (`client`), the model as the commands see it (`model`) and its answers (`answers`)."""
