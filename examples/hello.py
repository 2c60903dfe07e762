# A first program for airlock: it prints, looks around, and its last expression is the result.
import os
import platform
import socket

print(f"hello from Python {platform.python_version()} in a sandbox")
{
    "uid": os.getuid(),
    "hostname": socket.gethostname(),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "root": sorted(os.listdir("/")),
}
