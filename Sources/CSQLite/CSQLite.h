#include <sqlite3.h>

// SQLITE_TRANSIENT is a macro casting -1 to a function pointer, which Swift
// cannot import: the same value, as a function Swift can call.
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
