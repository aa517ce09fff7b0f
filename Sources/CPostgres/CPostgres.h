// libpq (Debian libpq-dev): the PostgreSQL client library, for the shared
// delivery store (docs/deliver-later.md).
#include <libpq-fe.h>
