#!/bin/bash
# What travels to a device call: the device tool sends the tracked files, the untracked files git does not ignore and
# the carried paths, 64 MiB in all. The tracked tree is about 60 MiB (the zoo's and the real pair's shipped weights)
# and the wheels the GPU image lacks (../shared/gpu/prepare-wheels.sh) about 15 MiB, so each call leaves behind the
# weights it does not need: `leave` takes them out of git's index (the files stay on disk) and ignores them until
# `restore`. Commit nothing in between. The plan of device calls that uses this: dev/README.md.
#
#   dev/gpu/travel.sh leave real|zoo...   leave the real pair's / the zoo's shipped weights behind
#   dev/gpu/travel.sh restore             track them again
#   dev/gpu/travel.sh split FILE          cut FILE into .parts/NAME.partNN of 48 MiB, one to carry per call
#   dev/gpu/travel.sh size [PATH...]      the MiB that would travel with PATH... carried
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
EXCLUDE=.git/info/exclude
BEGIN="# left behind for a device call (travel.sh)"
END="# end (travel.sh)"
declare -A WEIGHTS=([real]="model_build/real/smollm2/*.safetensors" [zoo]="model_build/zoo/*/*/model.safetensors")

left_behind() {  # the patterns between the markers
  sed -n "/^$BEGIN\$/,/^$END\$/p" "$EXCLUDE" 2>/dev/null | grep -v '^#' | sed 's|^/||' || true
}

size() {
  local tracked untracked carried
  tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  untracked=$(git ls-files -z -o --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1)
  carried=$( (($#)) && du -cb "$@" | tail -1 | cut -f1 || echo 0)
  python3 -c "import sys; t, u, c = map(int, sys.argv[1:]); total = (t + u + c) / 2**20
print(f'travels: {total:.1f} MiB (tracked {t / 2**20:.1f}, untracked {u / 2**20:.1f}, carried {c / 2**20:.1f}); '
      + ('fits the 64 MiB' if total <= 64 else 'OVER the 64 MiB: leave more behind'))" "$tracked" "${untracked:-0}" "$carried"
}

case "${1:-}" in
  leave)
    shift
    (($#)) || { echo "error: leave takes real and/or zoo" >&2; exit 2; }
    patterns=$(left_behind)
    for name in "$@"; do
      [[ -n "${WEIGHTS[$name]:-}" ]] || { echo "error: no weights named $name (real, zoo)" >&2; exit 2; }
      git rm -q --cached -- "${WEIGHTS[$name]}"
      patterns=$(printf '%s\n%s' "$patterns" "${WEIGHTS[$name]}")
    done
    sed -i "/^$BEGIN\$/,/^$END\$/d" "$EXCLUDE"
    { echo "$BEGIN"; echo "$patterns" | sed '/^$/d' | sort -u | sed 's|^|/|'; echo "$END"; } >> "$EXCLUDE"
    echo "left behind (on disk, untracked): $(left_behind | tr '\n' ' ')— run '$0 restore' before any commit"
    size ;;
  restore)
    for pattern in $(left_behind); do git reset -q -- "$pattern"; done
    sed -i "/^$BEGIN\$/,/^$END\$/d" "$EXCLUDE"
    git status --short | grep -q '^D ' && { echo "error: deletions still staged (git status)" >&2; exit 1; }
    echo "every shipped weight is tracked again"; size ;;
  split)
    [[ -f "${2:-}" ]] || { echo "error: split takes a file" >&2; exit 2; }
    grep -qx '/.parts/' "$EXCLUDE" || echo '/.parts/' >> "$EXCLUDE"
    mkdir -p .parts
    split -d -b 48M "$2" ".parts/$(basename "$2").part"
    sha256sum "$2" | sed 's|  .*/|  |' > ".parts/$(basename "$2").sha256"
    ls -l .parts ;;
  size) shift; size "$@" ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
