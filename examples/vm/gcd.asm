# gcd(1071, 462) in a bpf-to-bpf function: its own stack frame, r6-r9 kept for the caller.
mov %r6, 7
mov %r1, 1071
mov %r2, 462
call local gcd
mul %r0, %r6
div %r0, 7
exit
gcd:
mov %r6, 0
stxdw [%r10-8], %r1
loop:
jeq %r2, 0, found
mov %r3, %r1
mod %r3, %r2
mov %r1, %r2
mov %r2, %r3
ja loop
found:
mov %r0, %r1
exit
