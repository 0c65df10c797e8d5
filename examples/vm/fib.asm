# The 90th Fibonacci number, iteratively: a counted loop of 64-bit ALU operations.
mov %r0, 0
mov %r1, 1
mov %r2, 90
loop:
jeq %r2, 0, done
mov %r3, %r0
add %r3, %r1
mov %r0, %r1
mov %r1, %r3
sub %r2, 1
ja loop
done:
exit
