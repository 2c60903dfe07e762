# airlock's zygote: started once, inside a template jail, as
#   python -I -S -B /.zygote/zygote.py <preloads>
# with its other arguments in /.zygote/arguments (NUL-separated; the command line is what `ps`
# shows of the zygote and each child): <library> <program code> <sys.path for preloads>
# <prepare> <more> <warm-up> <the preloads' environment variables, unset before any child>.
# With <prepare> 1, the program, run here with the one argument `--zygote`, only defines
# things and a function `__zygote_start__`, which each child calls (airlock's runner is such
# a program), and <more> then runs in its namespace; with 0, each child runs the whole program.
# <warm-up> runs once right after the preloads, in a namespace of its own (the caller's code:
# what a first use of a preload costs, paid here once). A `__zygote_rehearse__` that the
# warm-up or the program defines runs again in the fork the zygote surveys (see below).
# It imports the preloads, compiles the program, freezes what is loaded, and waits. For each
# child airlock's library (the sandbox crate, loaded with ctypes) gets a jail and forks with
# the interpreter's own fork hooks, as os.fork does (random reseeds, threads reset), and
# the child enters its jail and confines itself in that library before it runs the program
# as `python -c <program code> <args>` would. The zygote never runs the program itself.
import gc
import os
import sys


def reseeder():
    # Every generator of random numbers (or secret) that the zygote's modules and program
    # hold, found once, wherever it is referenced, and made each child's own by a fork hook (as
    # random's own makes its global instance): fresh state from the OS's entropy, written with
    # as few pages touched as can be (each page a child writes is a copy of the zygote's).
    # Generators that reseed themselves when the pid changes (tempfile's names) would not: a
    # child's pid is the zygote's number in another PID namespace. None when there are none.
    rand = sys.modules.get("_random")
    random = sys.modules.get("random")
    npr = sys.modules.get("numpy.random")
    mp = sys.modules.get("multiprocessing.process")
    kinds = tuple(k for k in (rand and rand.Random, npr and npr.RandomState, npr and npr.BitGenerator) if k)
    found = {id(o): o for o in generators(kinds)} if kinds else {}
    seeded, keys, others = [], [], []
    for o in list(found.values()):
        if npr is not None and isinstance(o, npr.RandomState):
            # numpy's legacy generator: its bit generator is reseeded; the normal deviate it
            # may hold for the next draw is dropped here, once for every child.
            found.pop(id(o))
            found[id(o._bit_generator)] = o._bit_generator
            state = o.get_state()
            if state[3]:
                o.set_state(state[:3] + (0, 0.0))
    for o in found.values():
        if npr is not None and isinstance(o, npr.BitGenerator):
            key = mt19937_key(o) if isinstance(o, npr.MT19937) else None
            if key is not None:
                keys.append(key)
            else:
                type(o)(0)  # made from a seed as numpy's own are, or the zygote fails here
                others.append(o)
        elif not (random is not None and (o is random._inst or isinstance(o, random.SystemRandom))):
            o.seed(int.from_bytes(os.urandom(32), "little"))  # as each child will, or fails here
            seeded.append(o)
    if not (seeded or keys or others or mp):
        return None
    urandom = os.urandom
    # An MT19937's position after a fresh key: its next draw makes the key's first block.
    first = (624).to_bytes(4, "little")

    def reseed():
        try:
            for r in seeded:
                r.seed(int.from_bytes(urandom(32), "little"))
            for key in keys:
                key[:2496] = urandom(2496)
                key[2496:] = first
            for b in others:
                b.state = type(b)(int.from_bytes(urandom(32), "little")).state
            if mp is not None:
                mp.current_process().authkey = urandom(32)
        except BaseException as e:
            # A child that may draw what its siblings draw runs nothing.
            print("airlock zygote: reseeding a child: %r" % e, file=sys.stderr, flush=True)
            os._exit(70)

    return reseed


def generators(kinds):
    # Every object of `kinds` that any object refers to, found in a fork of the zygote, which
    # sends their addresses back (the zygote's objects at the same addresses): the lists of
    # every object that the scan makes would mark the zygote's allocator (glibc raises its
    # mmap threshold to the largest block freed), and each child would copy more of its pages.
    # No collection runs here meanwhile, so every object the fork found is still there.
    ctypes = sys.modules["ctypes"]
    collecting = gc.isenabled()
    gc.disable()
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                # What is frozen (the runner freezes what it loaded) is not among the objects
                # the collector lists; what it does not track is among their referents.
                gc.unfreeze()
                tracked = gc.get_objects()
                found = set()
                for objects in (tracked, gc.get_referents(*tracked)):
                    for o in objects:
                        # type(), not isinstance(): no attribute of a foreign object is read.
                        if issubclass(type(o), kinds):
                            found.add(id(o))
                sent = b"".join(b"%d\n" % i for i in found)
                while sent:
                    sent = sent[os.write(w, sent):]
            except BaseException as e:
                print("airlock zygote: finding generators: %r" % e, file=sys.stderr, flush=True)
                os._exit(1)
            os._exit(0)
        os.close(w)
        addresses = b"".join(iter(lambda: os.read(r, 1 << 16), b""))
        os.close(r)
        if os.waitpid(pid, 0)[1] != 0:
            raise RuntimeError("the fork that looked for generators failed")
        return [ctypes.cast(int(a), ctypes.py_object).value for a in addresses.split()]
    finally:
        if collecting:
            gc.enable()


def mt19937_key(bg):
    # An MT19937's state where numpy keeps it (624 words, then the position), to be written in
    # place: reseeding through numpy (its seeding and its arrays) touches a hundred and more
    # pages in a fresh child. None when the memory there is not that state.
    ctypes = sys.modules["ctypes"]
    state = bg.state["state"]
    key = memoryview((ctypes.c_char * 2500).from_address(bg.ctypes.state_address)).cast("B")
    there = bytes(key)
    expected = b"".join(int(word).to_bytes(4, "little") for word in state["key"])
    if len(state["key"]) != 624 or there != expected + int(state["pos"]).to_bytes(4, "little"):
        return None
    return key


def arguments():
    # As the positional arguments they were: <library> <preloads> <program code> <sys.path
    # for preloads> <prepare> <more> <warm-up> <the preloads' own environment variables>.
    with open("/.zygote/arguments", "rb") as f:
        library, code, path, prepare, more, warm, env = f.read().decode("utf-8", "surrogateescape").split("\0")
    return [sys.argv[0], library, sys.argv[1] if len(sys.argv) > 1 else "", code, path, prepare, more, warm, env]


def serve():
    sys.argv = arguments()
    before = set(sys.modules)
    import ctypes

    helpers = set(sys.modules) - before
    lib = ctypes.PyDLL(sys.argv[1])
    # What a child's exit writes of C's buffered output (see finish.py).
    flush_c = ctypes.CDLL(None).fflush
    lib.airlock_zygote_child.restype = ctypes.c_size_t
    lib.airlock_zygote_child.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.airlock_zygote_survey.restype = None
    lib.airlock_zygote_survey.argtypes = [ctypes.c_int]
    buf = ctypes.create_string_buffer(1 << 18)
    # The seccomp filters the children inherit, before anything else runs here.
    if lib.airlock_zygote_start() != 0:
        os._exit(1)
    source = sys.argv[3]
    code = compile(source, "<string>", "exec")
    preload = list(filter(None, sys.argv[2].split(",")))
    path = list(sys.path)
    sys.path.extend(filter(None, sys.argv[4].split("\n")))
    for name in preload:
        try:
            __import__(name)
        except Exception as e:
            print("airlock zygote: preloading %s: %r" % (name, e), file=sys.stderr, flush=True)
    rehearsals = []
    if sys.argv[7]:
        # Still with the preloads' sys.path: what the warm-up imports is found where they were.
        warm = {"__name__": "__zygote_warm_up__"}
        try:
            exec(compile(sys.argv[7], "<warm-up>", "exec"), warm)
        except Exception as e:
            warm = {}
            print("airlock zygote: warming up: %r" % e, file=sys.stderr, flush=True)
        rehearsals.append(warm.get("__zygote_rehearse__"))
    sys.path[:] = path
    if preload:
        # Preloads may hold on to ctypes (numpy does): a second copy would not mix with theirs.
        helpers = set()
    main = None
    if sys.argv[5] == "1":
        main = type(sys)("__main__")
        main.__builtins__ = __builtins__
        own, argv = sys.modules["__main__"], sys.argv
        sys.modules["__main__"], sys.argv = main, ["-c", "--zygote"]
        try:
            exec(code, main.__dict__)
            if argv[6]:
                exec(compile(argv[6], "<string>", "exec"), main.__dict__)
        except BaseException as e:
            print("airlock zygote: the program cannot be prepared: %r" % e, file=sys.stderr, flush=True)
            os._exit(1)
        sys.modules["__main__"], sys.argv = own, argv
        if not callable(main.__dict__.get("__zygote_start__")):
            print("airlock zygote: the program defines no __zygote_start__", file=sys.stderr, flush=True)
            os._exit(1)
    # What the preloads read as they loaded is theirs, not the children's.
    for name in filter(None, sys.argv[8].split("\n")):
        os.environ.pop(name, None)
    gc.collect()
    try:
        reseed = reseeder()
    except Exception as e:
        print("airlock zygote: a generator of random numbers cannot be reseeded: %r" % e, file=sys.stderr, flush=True)
        os._exit(1)
    if reseed is not None:
        os.register_at_fork(after_in_child=reseed)
    # What ctypes was loaded for here is done (the reseeder found its addresses): the modules
    # its import added leave sys.modules now, once, not in each child (every object a child
    # touches costs it a copy of its page); `lib` keeps what the children call.
    for name in helpers:
        sys.modules.pop(name, None)
    gc.freeze()
    # The heap's free pages go back to the kernel (glibc's; another C library has no such call):
    # a fork copies no page table entry for them, a child's exit has none to tear down, and a
    # child that allocates there gets a zeroed page instead of a copy of ours.
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
    if main is not None:
        rehearsals.append(main.__dict__.get("__zygote_rehearse__"))
    rehearsals = [r for r in rehearsals if callable(r)]
    if rehearsals:
        # Which of our pages a child writes, seen in a fork that does what a child does (the
        # warm-up's rehearsal, a first chart for airlock's engine; the program's, a small
        # request for its runner) and stops: each child copies them while it waits for its
        # request, not one fault at a time once the request has come (the library's `survey`
        # and `prefault`).
        pid = os.fork()
        if pid == 0:
            try:
                null = os.open("/dev/null", os.O_WRONLY)
                os.dup2(null, 1)
                for rehearse in rehearsals:
                    rehearse()
            except BaseException as e:
                # A survey is of the whole of it or of nothing (the fork ends unstopped).
                print("airlock zygote: surveying: %r" % e, file=sys.stderr, flush=True)
                os._exit(1)
            lib.airlock_zygote_surveyed()
        lib.airlock_zygote_survey(pid)
    if lib.airlock_zygote_ready() != 0:
        os._exit(1)
    # How many modules the zygote has: a child's own come after them (sys.modules keeps the
    # order of insertion), and telling them apart must not touch the zygote's (every object a
    # child touches costs it a copy of its page).
    loaded = len(sys.modules)
    # The environment as the host sends a child's (`KEY=VALUE` entries, in its order): a child
    # whose environment is the zygote's own, in the same order, leaves it as it is.
    own_env = b"\0".join(b"%s=%s" % item for item in os.environb.items())
    # The library waits for requests and forks each child as os.fork() would (the
    # interpreter's hooks around the fork): no Python runs here between two children.
    got = lib.airlock_zygote_serve()
    if got != 1:
        os._exit(0 if got == 0 else 1)
    size = lib.airlock_zygote_child(buf, len(buf))
    # The child goes on from here and never returns (its end is `_finish`'s `_exit`): what
    # this frame holds is never freed, as each object freed, or whose count drops, is a write
    # to a page the child shares with the zygote. `string_at`: only what was written (`raw`
    # would copy the whole buffer, 64 new pages).
    child(code, source, main, ctypes.string_at(buf, size), own_env, loaded, flush_c)


def environment(entries):
    # The child's environment where it is not the zygote's, in the host's order: made in place
    # when the zygote's has the child's keys in that order (each key set is a write to pages
    # the child shares with the zygote), made anew otherwise.
    wanted = {}
    for entry in entries:
        key, _, value = entry.partition(b"=")
        wanted[key] = value
    env = os.environb
    if [key for key in env if key in wanted] == list(wanted):
        for key in [key for key in env if key not in wanted]:
            del env[key]
        for key, value in wanted.items():
            if env[key] != value:
                env[key] = value
    else:
        env.clear()
        env.update(wanted)
    # What a fresh interpreter adds to its environment (PEP 538's locale coercion).
    if "LC_ALL" not in os.environ and (os.environ.get("LC_CTYPE") or os.environ.get("LANG") or "C") in ("C", "POSIX"):
        os.environ["LC_CTYPE"] = "C.UTF-8"


def child(code, source, main, spec, own_env, loaded, flush_c):
    # The program's arguments and environment as `python -c <code> <args>` would have them.
    fields = spec.split(b"\0")
    argc = int(fields[0])
    args = [f.decode("utf-8", "surrogateescape") for f in fields[1:1 + argc]]
    if b"\0".join(fields[1 + argc:]) != own_env:
        environment(fields[1 + argc:])
    # The host sends only the arguments after the code, the rest being the zygote's own
    # command line (its interpreter and flags, before this file's path) and its program.
    sys.orig_argv = sys.orig_argv[:sys.orig_argv.index("/.zygote/zygote.py")] + ["-c", source] + args
    sys.argv = ["-c"] + args
    if main is None:
        program = type(sys)("__main__")
        program.__builtins__ = __builtins__
    else:
        program = main
    sys.modules["__main__"] = program
    del fields, argc, args, spec
    try:
        if main is not None:
            program.__zygote_start__()
        else:
            exec(code, program.__dict__)
    except SystemExit as e:
        _finish(_exit_status(e.code), loaded, flush_c)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        _finish(1, loaded, flush_c)
    _finish(0, loaded, flush_c)


serve()
# Only the zygote returns, and only to end: it exits in `serve`.
os._exit(1)
