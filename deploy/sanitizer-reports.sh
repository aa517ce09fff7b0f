#!/usr/bin/env bash
# After `make sanitize-thread` / `sanitize-address`: every process of the run
# wrote its sanitizer reports under DIR (log_path); none may exist.
#   deploy/sanitizer-reports.sh DIR NAME
dir=${1:?usage: sanitizer-reports.sh DIR NAME}; name=${2:-sanitizer}
shopt -s nullglob
reports=("$dir"/report*)
if [ ${#reports[@]} -eq 0 ]; then
  echo "$name: no reports"
  exit 0
fi
echo "$name: ${#reports[@]} report file(s) in $dir; the first:"
head -60 "${reports[0]}"
exit 1
