#include <sys/select.h>
#include <curl/curl.h>
