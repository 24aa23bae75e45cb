"""Publish events into a weir job's ipc source endpoint from Python, through the C ABI.

    python3 ringbuf/examples/python/publisher.py <libweir_ring.so> <endpoint path> <records>

Record n is a job file's Event (key n % 97, value n * 3, time_ns n * 1000, seq n: four
little-endian u64s). Starts at the endpoint's next number; waits while the job has no
room (back pressure); closes the stream at the end. Prints sent=... no_credit=...
"""
import ctypes
import struct
import sys
import time


def main():
    lib_path, path, count = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
    lib = ctypes.CDLL(lib_path)
    lib.weir_publisher_connect.restype = ctypes.c_void_p
    lib.weir_publisher_connect.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    for name in ("weir_publisher_try_send", "weir_publisher_send"):
        f = getattr(lib, name)
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                      ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_size_t]
    lib.weir_publisher_next_seq.restype = ctypes.c_uint64
    lib.weir_publisher_next_seq.argtypes = [ctypes.c_void_p]
    lib.weir_publisher_close.argtypes = [ctypes.c_void_p]
    lib.weir_publisher_detach.argtypes = [ctypes.c_void_p]

    err = ctypes.create_string_buffer(512)
    deadline = time.monotonic() + 30
    p = None
    while not p:
        p = lib.weir_publisher_connect(path, err, len(err))
        if not p:
            if time.monotonic() > deadline:
                sys.exit("publisher: " + err.value.decode())
            time.sleep(0.01)  # the job may not have made the endpoint yet
    first = lib.weir_publisher_next_seq(p)
    seq = ctypes.c_uint64()
    no_credit = 0
    for n in range(first, count):
        record = struct.pack("<4Q", n % 97, n * 3, n * 1000, n)
        rc = lib.weir_publisher_try_send(p, record, len(record), ctypes.byref(seq), err, len(err))
        if rc == 0:
            no_credit += 1
            rc = lib.weir_publisher_send(p, record, len(record), ctypes.byref(seq), err, len(err))
        if rc < 0 or seq.value != n:
            lib.weir_publisher_detach(p)
            sys.exit(f"publisher: record {n}: {err.value.decode()} (number {seq.value})")
    print(f"first={first} sent={count - first} no_credit={no_credit}")
    lib.weir_publisher_close(p)


if __name__ == "__main__":
    main()
