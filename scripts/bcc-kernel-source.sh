#!/usr/bin/env bash
# Prints a kernel header tree for BCC_KERNEL_SOURCE, setting one up if needed:
#
#     export BCC_KERNEL_SOURCE=$(scripts/bcc-kernel-source.sh)
#
# BCC (Debian's bpfcc-tools, python3-bpfcc) compiles its programs at run time against kernel
# headers, by default /lib/modules/$(uname -r)/build. A kernel without its headers package
# (a custom or cloud kernel: this machine runs 6.18, Debian ships headers for 6.1) still works
# with the headers of another version, named by BCC_KERNEL_SOURCE, for programs that probe
# user space (uprobes, USDT: they read no kernel structure). Debian splits a header package
# in two directories, /usr/src/linux-headers-VERSION-FLAVOUR (generated headers, .config) and
# /usr/src/linux-headers-VERSION-common (the rest), and BCC_KERNEL_SOURCE names one tree: this
# script merges the two into a tree of symbolic links (a second, about 10,000 links), once,
# under target/bcc-kernel-source/ (or $USERBPF_BCC_HEADERS_DIR).
#
# Which headers: the running kernel's own tree when it is complete; else the running kernel's
# Debian packages; else the newest linux-headers-*-FLAVOUR installed (install-deps.sh installs
# linux-headers-amd64). Fails, naming the package to install, when there are none.
set -euo pipefail

release=$(uname -r)
complete() { # complete DIR: a tree BCC can use as is
    [ -f "$1/include/linux/kconfig.h" ] && [ -f "$1/include/generated/autoconf.h" ]
}
if complete "/lib/modules/$release/build"; then
    readlink -f "/lib/modules/$release/build"
    exit 0
fi

# The flavour directory: it holds the generated headers and a Makefile including the common one.
flavour=""
if [ -f "/usr/src/linux-headers-$release/include/generated/autoconf.h" ]; then
    flavour="/usr/src/linux-headers-$release"
else
    for d in $(ls -d /usr/src/linux-headers-* 2>/dev/null | sort -V -r); do
        if [ -f "$d/include/generated/autoconf.h" ]; then
            flavour=$d
            break
        fi
    done
fi
if [ -z "$flavour" ]; then
    echo "bcc-kernel-source: no kernel headers under /usr/src (install Debian's linux-headers-amd64, as scripts/install-deps.sh does)" >&2
    exit 1
fi
common=$(sed -n 's|^include \(/usr/src/[^ ]*\)/Makefile$|\1|p' "$flavour/Makefile" | head -n 1)
if complete "$flavour"; then
    echo "$flavour"
    exit 0
fi
if [ -z "$common" ] || [ ! -f "$common/include/linux/kconfig.h" ]; then
    echo "bcc-kernel-source: $flavour has no common headers (its Makefile names none, or $common lacks include/linux/kconfig.h)" >&2
    exit 1
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=${USERBPF_BCC_HEADERS_DIR:-$here/target/bcc-kernel-source}
tree="$base/$(basename "$flavour")"
stamp="minmax-1 $common $flavour $(stat -c %Y "$common/include/linux/kconfig.h" "$flavour/include/generated/autoconf.h" | tr '\n' ' ')"
if [ -f "$tree/.userbpf-stamp" ] && [ "$(cat "$tree/.userbpf-stamp")" = "$stamp" ]; then
    echo "$tree"
    exit 0
fi

# Built beside the final place and renamed into it: a concurrent run (tests in parallel) sees
# either no tree or a complete one.
mkdir -p "$base"
work=$(mktemp -d "$base/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -rs "$common/." "$work/"
cp -rsf "$flavour/." "$work/"
# BCC cannot compile 6.1's min()/max() (its __careful_cmp: "cannot call non-static helper
# function", BCC issue 5241; sslsniff uses min()): the merged tree's minmax.h includes the
# real one, then defines them plainly.
mm="$work/include/linux/minmax.h"
if [ -L "$mm" ]; then
    real=$(readlink -f "$mm")
    rm "$mm"
    {
        echo "/* $real, with min() and max() as BCC can compile them (scripts/bcc-kernel-source.sh). */"
        echo "#include \"$real\""
        echo "#undef min"
        echo "#undef max"
        echo "#define min(x, y) ({ typeof(x) __ub_x = (x); typeof(y) __ub_y = (y); __ub_x < __ub_y ? __ub_x : __ub_y; })"
        echo "#define max(x, y) ({ typeof(x) __ub_x = (x); typeof(y) __ub_y = (y); __ub_x > __ub_y ? __ub_x : __ub_y; })"
    } > "$mm"
fi
echo "$stamp" > "$work/.userbpf-stamp"
if [ -f "$tree/.userbpf-stamp" ] && [ "$(cat "$tree/.userbpf-stamp")" = "$stamp" ]; then
    echo "$tree" # set up meanwhile by a concurrent run
    exit 0
fi
if [ -e "$tree" ]; then
    old=$(mktemp -d "$base/.old-XXXXXX")
    mv -T "$tree" "$old/tree" 2>/dev/null || true
    rm -rf "$old"
fi
mv -T "$work" "$tree" 2>/dev/null || [ -f "$tree/.userbpf-stamp" ]
echo "$tree"
