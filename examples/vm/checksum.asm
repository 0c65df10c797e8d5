# The Internet checksum (RFC 1071) of the IPv4 header in memory: r1 = header, r2 = length.
mov %r0, 0
mov %r3, 0
loop:
jge %r3, %r2, fold
mov %r4, %r1
add %r4, %r3
ldxh %r5, [%r4+0]
be16 %r5
add %r0, %r5
add %r3, 2
ja loop
fold:
mov %r4, %r0
rsh %r4, 16
and %r0, 0xffff
add %r0, %r4
mov %r4, %r0
rsh %r4, 16
add %r0, %r4
and %r0, 0xffff
xor %r0, 0xffff
exit
