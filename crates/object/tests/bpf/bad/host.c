// Compiled for the host, not BPF: refused for its ELF machine.
int host_function(int x) { return x + 1; }
