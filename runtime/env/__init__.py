"""Process-wide state: the environment (discovered devices, EP libraries), selection, shared memory."""
