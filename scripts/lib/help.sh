# Sourced by the scripts before they read their arguments: `source .../lib/help.sh "$@"`. With -h or
# --help as the first argument it prints the script's header comment (its usage) and exits 0;
# otherwise it does nothing. Only the first argument counts: later ones may be the trainer's
# flags, where -h is HellaSwag.
case "${1:-}" in
  -h|--help)
    sed -n '2,${/^#\( \|$\)/!q;s/^# \{0,1\}//p}' "$0"
    exit 0 ;;
esac
