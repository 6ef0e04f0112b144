from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("shop", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Tick",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("label", models.CharField(max_length=100)),
                ("task_id", models.CharField(max_length=64)),
                ("at_ms", models.BigIntegerField(null=True)),
                ("ran", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
