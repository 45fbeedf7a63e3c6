//! The one table of environment variables the package reads: what each holds, its
//! default, what it does and what an unusable value gets. The engine checks its own knobs
//! from it before every request (`knobs::check`); the documentation's environment page is
//! generated from it (`_core.knobs()`), and its build fails on a variable the code reads
//! that this table does not describe.

use super::Kind;

/// Who reads a variable, which decides what an unusable value gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The engine: checked before every request; a bad value fails the request.
    Engine,
    /// The Python package, where it says what a bad value gets.
    Python,
    /// Triton's own variable, which the drop-ins follow as Triton does.
    Triton,
    /// Set by the package for its own worker processes: never set it yourself.
    Internal,
    /// A standard variable of the system the package follows.
    System,
}

/// One environment variable.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    pub name: &'static str,
    pub kind: Kind,
    pub reader: Reader,
    /// The value in force when it is unset or blank.
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// What a value that does not parse gets (the engine's knobs: an error, always).
    pub unusable: &'static str,
}

const FAILS: &str = "an `InvalidArgumentError` naming the variable and its value, before \
                     anything runs";
const FAILS_THERE: &str = "an `InvalidArgumentError` naming the variable and its value, \
                           where it is read";
const ANY_TEXT: &str = "any text is taken; a path that does not work is named by the step \
                        that uses it";

const fn engine(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    meaning: &'static str,
) -> Knob {
    Knob {
        name,
        kind,
        reader: Reader::Engine,
        default,
        meaning,
        unusable: match kind {
            Kind::Text => ANY_TEXT,
            _ => FAILS,
        },
    }
}

/// Every variable the package reads.
pub const KNOBS: &[Knob] = &[
    engine(
        "XPU_ZEBIN_OCLOC",
        Kind::Text,
        "`ocloc` on `PATH`",
        "the ocloc to use when none is passed",
    ),
    engine(
        "XPU_ZEBIN_CACHE_DIR",
        Kind::Text,
        "`$XDG_CACHE_HOME/xpu-zebin`, else `~/.cache/xpu-zebin`",
        "the binary cache's directory (without a home, `cache` in the private directory); \
         it must be this user's and not writable by others",
    ),
    engine(
        "XPU_ZEBIN_CACHE_MAX_BYTES",
        Kind::Bytes,
        "1073741824 (1 GiB)",
        "the cache's size bound in bytes; over it, the least recently used entries go first \
         until the cache holds nine tenths of it",
    ),
    engine(
        "XPU_ZEBIN_TIMEOUT",
        Kind::Seconds,
        "900",
        "seconds per compiler run (0: no limit; at most 1e9)",
    ),
    engine(
        "XPU_ZEBIN_SPECULATE_AFTER",
        Kind::SecondsOrOff,
        "0.2",
        "when a kernel's default-GRF build has run this many seconds and a core is idle, its \
         large-GRF build starts beside it (a hedge: the answer is the same, sooner when the \
         large GRF is needed); 0: as soon as a core is idle; off: never by time (SPIR-V of \
         32 KiB or more still starts it on an idle core). `speculative=True` or `False` on a \
         request overrides it",
    ),
    engine(
        "XPU_ZEBIN_SHARE_BUILDS",
        Kind::Bool,
        "true",
        "true: one build per kernel for every thread, process and host using one cache \
         directory (a request that misses a kernel another is building waits for it and is \
         answered from its entry), and so is Triton's front end under the drop-in (one \
         run per kernel for processes sharing Triton's cache directory); a failure that \
         repeats (PTSS in both GRF modes, a kernel the compiler refuses) is remembered for \
         its kernel and compiler; false: each request builds for itself",
    ),
    engine(
        "XPU_ZEBIN_CORE_WAIT_SECONDS",
        Kind::Seconds,
        "10",
        "with builds shared, when every core of the host runs a compiler (this process's \
         or another's), a build of a kernel nobody has claimed first waits this long (at \
         most an hour) for another's build of it to be kept, or a core to free, then \
         builds; a process running no compiler whose wait ran out builds at once from then \
         on; behind its own builds, it goes on once none of its cores has freed for this \
         long, or after four times this in all; 0: never wait for a core. A process \
         pinned to some of the host's cores never waits",
    ),
    engine(
        "XPU_ZEBIN_CACHE_COMPRESS",
        Kind::Bool,
        "true",
        "true: the local cache keeps entries compressed (zstd, about 4x smaller: a bounded or \
         shared cache holds about four times the kernels); false: it keeps the entries this \
         host builds as built, for the cheapest warm hit (a 170 KB entry: 0.17 ms against \
         0.39 ms here). Either is read either way; the fleet's store and bundles are always \
         compressed",
    ),
    engine(
        "XPU_ZEBIN_PERSISTENT",
        Kind::Bool,
        "true",
        "false: one `ocloc` process per compile, no persistent workers",
    ),
    engine(
        "XPU_ZEBIN_ISOLATED",
        Kind::Bool,
        "true",
        "false: Level Zero compiles SPIR-V and loads native binaries in the calling process \
         (an input that crashes IGC or the loader ends it)",
    ),
    engine(
        "XPU_ZEBIN_WORKER_IDLE_SECONDS",
        Kind::Seconds,
        "300",
        "an idle persistent worker exits after this long (0: each ends after its job); at \
         most 8 idle per compiler",
    ),
    engine(
        "XPU_ZEBIN_WORKER_RETRY_SECONDS",
        Kind::Seconds,
        "5",
        "a worker kind that failed to start 3 times in a row is tried again after this long \
         (doubling with each such failure, at most an hour); meanwhile ocloc runs one \
         process per compile",
    ),
    engine(
        "XPU_ZEBIN_CORE_SLOTS_DIR",
        Kind::Text,
        "`cores` in the private directory",
        "where the host's core slots are; this user's processes sharing it share the cores \
         (it must be this user's and not writable by others)",
    ),
    engine(
        "XPU_ZEBIN_SIMULATED_DEVICE",
        Kind::Text,
        "unset: the real devices",
        "`pvc`: Level Zero on a simulated device (development and CI only; set before \
         import)",
    ),
    engine(
        "XPU_ZEBIN_SPILL_POLICY",
        Kind::SpillPolicy,
        "`upstream`",
        "when spills call for the large-GRF retry: `upstream` (upstream's current line, or \
         the installed backend's own gate), `upstream@LINE[:PATH]`, `any`, `never`, \
         `slots:N`, `bytes:N`, `min-bytes:N` (see GRF and spill rules)",
    ),
    engine(
        "XPU_ZEBIN_BUNDLE",
        Kind::Text,
        "none (imported bundles are used)",
        "bundle directories (`:`-separated) the Triton drop-ins load native code from",
    ),
    engine(
        "XPU_ZEBIN_SIGNING_KEY",
        Kind::Text,
        "none",
        "the secret key file a farm signs with (`xpu-zebin key generate`; owner-only)",
    ),
    Knob {
        unusable: FAILS_THERE,
        ..engine(
            "XPU_ZEBIN_TRUSTED_KEYS",
            Kind::Text,
            "none",
            "the public keys (`name:hex`, comma- or blank-separated) whose store entries \
             and bundles this node takes; a list that names no key (`,`) or a malformed key \
             is an error, never \"trust nothing\"",
        )
    },
    Knob {
        unusable: FAILS_THERE,
        ..engine(
            "XPU_ZEBIN_REMOTE",
            Kind::Text,
            "none: no store",
            "the fleet's store: `redis://[user:password@]host:port/db` (`rediss://`: TLS, \
             `unix:///path?db=N`: a socket; query `ssl_ca_certs`, `ssl_certfile`, \
             `ssl_keyfile`, `ssl_cert_reqs`, `password`, `username`, `db`; any other is an \
             error)",
        )
    },
    Knob {
        unusable: FAILS_THERE,
        ..engine(
            "XPU_ZEBIN_REMOTE_MODE",
            Kind::Text,
            "`read-only`",
            "`read-only` or `read-write` (publish what this node compiles, signed)",
        )
    },
    engine(
        "XPU_ZEBIN_REMOTE_TIMEOUT",
        Kind::Seconds,
        "2",
        "the store's connect timeout and longest wait for a reply's next piece, in seconds \
         (0: the default); a whole operation has ten of them, at most 6 s, plus a second \
         per 32 MiB of values",
    ),
    engine(
        "XPU_ZEBIN_REMOTE_TTL",
        Kind::Seconds,
        "2592000 (30 days)",
        "seconds a published entry lives, rounded up to whole seconds (0: no expiry)",
    ),
    engine(
        "XPU_ZEBIN_REMOTE_MAX_BYTES",
        Kind::Bytes,
        "268435456 (256 MiB)",
        "the largest value read from the store",
    ),
    Knob {
        name: "XPU_ZEBIN_TRITON",
        kind: Kind::Bool,
        reader: Reader::Python,
        default: "false",
        meaning: "true: Triton's XPU backend and driver use this package in every process \
                  (read at interpreter start by the `.pth` hook)",
        unusable: "one WARNING; the drop-in stays off",
    },
    Knob {
        name: "XPU_ZEBIN_AUTOTUNE_JOBS",
        kind: Kind::Count,
        reader: Reader::Python,
        default: "0: as many as cores (else `TRITON_AUTOTUNING_COMPILE_WORKERS`)",
        meaning: "autotune configs compiled at once (1: off, Triton's own order)",
        unusable: "one WARNING; configs are compiled one by one, as Triton does",
    },
    Knob {
        name: "XPU_ZEBIN_AUTOTUNE_PIPELINE",
        kind: Kind::Bool,
        reader: Reader::Python,
        default: "false",
        meaning: "true: each autotune config is benchmarked as soon as it is built",
        unusable: FAILS_THERE,
    },
    Knob {
        name: "XPU_ZEBIN_AUTOTUNE_SCHEDULER",
        kind: Kind::Text,
        reader: Reader::Python,
        default: "none",
        meaning: "a Dask scheduler's address: autotune configs' native builds run on that \
                  cluster",
        unusable: "a scheduler that cannot be reached: one WARNING, the builds run here",
    },
    Knob {
        name: "XPU_ZEBIN_WORKER_AUB_DIR",
        kind: Kind::Text,
        reader: Reader::Internal,
        default: "none",
        meaning: "where a worker on the simulated device writes its captures (set by the \
                  package for its workers)",
        unusable: ANY_TEXT,
    },
    Knob {
        name: "TRITON_INTEL_DEVICE_ARCH",
        kind: Kind::Text,
        reader: Reader::Triton,
        default: "the device's own",
        meaning: "the architecture Triton builds for; the GRF ladder and the rules follow it",
        unusable: ANY_TEXT,
    },
    Knob {
        name: "TRITON_INTEL_ENABLE_IGC_SHADER_DUMP",
        kind: Kind::Bool,
        reader: Reader::Triton,
        default: "false",
        meaning: "`make_zebin` has IGC dump its shaders into the kernel's Triton cache \
                  directory (`knobs.intel.dump_shader_info`)",
        unusable: "anything but a true word is false, as in Triton",
    },
    Knob {
        name: "TRITON_AUTOTUNING_COMPILE_WORKERS",
        kind: Kind::Count,
        reader: Reader::Triton,
        default: "unset",
        meaning: "upstream's parallel autotune compiles, when `XPU_ZEBIN_AUTOTUNE_JOBS` is \
                  unset: N at once (0: half the cores, at most 4, as upstream's PR)",
        unusable: "one WARNING; configs are compiled one by one, as Triton does",
    },
    Knob {
        name: "TRITON_XPU_GEN_NATIVE_CODE",
        kind: Kind::Bool,
        reader: Reader::Triton,
        default: "false",
        meaning: "turned on by the drop-in before its first load, and left on: Triton's \
                  driver then gets native binaries only",
        unusable: "anything but a true word is false, as in Triton",
    },
    Knob {
        name: "TRITON_CACHE_DIR",
        kind: Kind::Text,
        reader: Reader::Triton,
        default: "Triton's (`~/.triton/cache`)",
        meaning: "Triton's cache; `precompile` points it at a directory of its own while it \
                  runs Triton's front end, and `bundle import` writes Triton's entries there",
        unusable: ANY_TEXT,
    },
    Knob {
        name: "TRITON_CACHE_MANAGER",
        kind: Kind::Text,
        reader: Reader::Triton,
        default: "Triton's file cache",
        meaning: "`xpu_zebin.triton.fleet_cache:FleetCacheManager` keeps Triton's entries in \
                  the fleet's signed store; with one set, `precompile` uses its cache rather than \
                  a private one",
        unusable: "Triton's own error when it imports the class",
    },
    Knob {
        name: "XDG_CACHE_HOME",
        kind: Kind::Text,
        reader: Reader::System,
        default: "`~/.cache`",
        meaning: "where the binary cache goes when `XPU_ZEBIN_CACHE_DIR` is unset",
        unusable: ANY_TEXT,
    },
    Knob {
        name: "TMPDIR",
        kind: Kind::Text,
        reader: Reader::System,
        default: "`/tmp`",
        meaning: "holds the package's private directory (`xpu-zebin-<uid>`: core slots, the \
                  record of binaries that loaded safely and of refused compilers)",
        unusable: "a private directory someone else made: one WARNING, the package goes on \
                   without it",
    },
    Knob {
        name: "TRITON_DEBUG",
        kind: Kind::Bool,
        reader: Reader::Triton,
        default: "false",
        meaning: "the package's DEBUG log on stderr too, as Triton's own",
        unusable: "anything but a true word is false, as in Triton",
    },
];
