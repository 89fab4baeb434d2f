/* placeholder until the launcher lands */
#include "postgres.h"
#include "outbox.h"
void
OutboxRegisterLauncher(void)
{
}
