import sys
cmd, key, prefix, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = sys.stdout.buffer
for i in range(n):
    m = b"%s%012d" % (prefix.encode(), i)
    if cmd == "HSET":
        args = [b"HSET", key.encode(), m, b"xxx"]
    else:
        args = [cmd.encode(), key.encode(), m]
    out.write(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
